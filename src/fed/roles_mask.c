/* roles_mask.c — a round in masking mode (fed.secure: masking): the
 * protocol of mask.h between the aggregator and the clients, the aggregator
 * relaying keys and sealed share boxes. The aggregator learns the sum of
 * the masked updates, never one of them; the key holder only keeps the
 * model (no key). Per round, ids 1..m go to the clients still in.
 *
 * Payloads (little endian), all of the round:
 *   ROUND    f64 weight, u32 id, u32 m, u32 t, f32 params[n]
 *   MKEYS    client -> aggregator: its two public keys (64 bytes)
 *   KEYSET   aggregator -> client: u8 u1[m + 1], keys[m + 1] (64 bytes each)
 *   SHARES   client -> aggregator: m share boxes (box v - 1 for client v)
 *   BOXES    aggregator -> client: u8 u2[m + 1], m boxes (box u - 1 from client u)
 *   MASKED   client -> aggregator: u32 y[n]
 *   UNMASK   aggregator -> client: u8 u2[m + 1], u8 u3[m + 1]
 *   ANSWERS  client -> aggregator: (m + 1) × (u8 kind, u64 y[5]) */
#include "fed/mask.h"
#include "fed/roles_internal.h"

#define SHARE_WIRE (1 + 8 * TS_SHAMIR_K)

static void share_put(uint8_t *p, const ts_mask_share *s) {
    p[0] = s->kind;
    memcpy(p + 1, s->y, sizeof s->y);
}
static void share_get(const uint8_t *p, ts_mask_share *s) {
    s->kind = p[0];
    memcpy(s->y, p + 1, sizeof s->y);
}

/* ---- aggregator ---- */

typedef struct mround {
    int mm, t, idx[MAX_PEERS + 1]; /* idx[id]: the peer of id */
    uint8_t u1[MAX_PEERS + 1], u2[MAX_PEERS + 1], u3[MAX_PEERS + 1];
} mround;

/* Receives one message of `type` from the peer of each id in `in`; on
 * success calls take (which may refuse it), else drops the peer. */
typedef ts_status (*take_fn)(void *ctx, int id, const ts_fed_msg *m);
static void collect(agg *a, mround *q, int r, uint32_t type, uint64_t max_len, const uint8_t *in,
                    uint8_t *out, take_fn take, void *ctx, uint64_t *up) {
    for (int id = 1; id <= q->mm; id++) {
        peer *p = &a->cl[q->idx[id]];
        if (!in[id] || !p->alive) continue;
        ts_fed_msg m;
        if (expect(p->c, type, (uint64_t)r, max_len, &m) != TS_OK) {
            drop(p, ts_last_error());
            continue;
        }
        *up += m.len;
        fedr_obs_client(a, p->name, m.len, 0);
        if (take(ctx, id, &m) != TS_OK)
            drop(p, ts_last_error());
        else
            out[id] = 1;
        ts_fed_msg_free(&m);
    }
}

typedef struct mctx {
    agg *a;
    mround *q;
    ts_mask_server *sv;
    ts_mask_keys *keys;
    uint8_t *boxes; /* [mm + 1][mm · BOX] */
    fedr_text text;
} mctx;

static ts_status take_keys(void *ctx, int id, const ts_fed_msg *m) {
    mctx *x = ctx;
    if (m->len != sizeof(ts_mask_keys))
        return ts_fail(TS_ERR_FORMAT, "fed: keys of %llu bytes", (unsigned long long)m->len);
    memcpy(&x->keys[id], m->data, sizeof(ts_mask_keys));
    return ts_mask_server_keys(x->sv, id, &x->keys[id]);
}

static ts_status take_shares(void *ctx, int id, const ts_fed_msg *m) {
    mctx *x = ctx;
    size_t want = (size_t)x->q->mm * TS_MASK_BOX;
    if (m->len != want)
        return ts_fail(TS_ERR_FORMAT, "fed: share boxes of %llu bytes", (unsigned long long)m->len);
    memcpy(x->boxes + (size_t)id * want, m->data, want);
    return TS_OK;
}

static ts_status take_masked(void *ctx, int id, const ts_fed_msg *m) {
    mctx *x = ctx;
    if (m->len != (uint64_t)x->a->n * 4)
        return ts_fail(TS_ERR_FORMAT, "fed: a masked update of the wrong size");
    ts_status s = ts_mask_server_add(x->sv, id, (const uint32_t *)m->data);
    if (s != TS_OK) return s;
    fedr_text_add(&x->text, x->a->cl[x->q->idx[id]].name, m);
    return TS_OK;
}

static ts_status take_answers(void *ctx, int id, const ts_fed_msg *m) {
    mctx *x = ctx;
    int mm = x->q->mm;
    if (m->len != (uint64_t)(mm + 1) * SHARE_WIRE)
        return ts_fail(TS_ERR_FORMAT, "fed: unmasking answers of the wrong size");
    ts_mask_share sh[MAX_PEERS + 1];
    for (int u = 0; u <= mm; u++) share_get(m->data + (size_t)u * SHARE_WIRE, &sh[u]);
    return ts_mask_server_shares(x->sv, id, sh);
}

/* Sends each id in `to` its message from make (buf of len bytes). */
static void send_all(agg *a, mround *q, int r, uint32_t type, const uint8_t *to, uint8_t *buf,
                     size_t len, void (*make)(mctx *x, int id, uint8_t *buf), mctx *x,
                     uint64_t *down) {
    for (int id = 1; id <= q->mm; id++) {
        peer *p = &a->cl[q->idx[id]];
        if (!to[id] || !p->alive) continue;
        if (make) make(x, id, buf);
        if (ts_fed_send(p->c, type, (uint64_t)r, buf, len) != TS_OK) {
            drop(p, ts_last_error());
        } else {
            *down += len;
            fedr_obs_client(a, p->name, 0, len);
        }
    }
}

static void make_boxes(mctx *x, int v, uint8_t *buf) {
    int mm = x->q->mm;
    size_t per = (size_t)mm * TS_MASK_BOX;
    memcpy(buf, x->q->u2, (size_t)mm + 1);
    for (int u = 1; u <= mm; u++) {
        uint8_t *dst = buf + mm + 1 + (size_t)(u - 1) * TS_MASK_BOX;
        if (x->q->u2[u] && u != v)
            memcpy(dst, x->boxes + (size_t)u * per + (size_t)(v - 1) * TS_MASK_BOX, TS_MASK_BOX);
        else
            memset(dst, 0, TS_MASK_BOX);
    }
}

ts_status fedr_agg_round_mask(agg *a, int r, FILE *metrics) {
    double t0 = now_s(), total = 0;
    mround q = {0};
    for (int i = 0; i < a->n_cl; i++)
        if (a->cl[i].alive) {
            q.idx[++q.mm] = i;
            total += (double)a->cl[i].samples;
        }
    q.t = a->fp->threshold > 0 ? a->fp->threshold : q.mm / 2 + 1;
    if (q.t < 2) q.t = 2;
    if (q.mm < 2 || q.t > q.mm)
        return ts_fail(
            TS_ERR_IO,
            "fed: round %d: %d clients left, masking needs a threshold of %d (fed.threshold)", r,
            q.mm, q.t);
    mctx x = {.a = a, .q = &q};
    size_t rb = 20 + (size_t)a->n * 4, per = (size_t)q.mm * TS_MASK_BOX;
    size_t big = rb > (size_t)(q.mm + 1) * 65 + per ? rb : (size_t)(q.mm + 1) * 65 + per;
    uint8_t *buf = malloc(big);
    uint32_t *sum = malloc((size_t)a->n * 4);
    x.keys = calloc((size_t)q.mm + 1, sizeof *x.keys);
    x.boxes = calloc((size_t)q.mm + 1, per);
    fedr_text_init(&x.text, q.mm);
    ts_status s = ts_mask_server_new(q.mm, q.t, (uint64_t)r, a->n, &x.sv);
    if (s == TS_OK && (!buf || !sum || !x.keys || !x.boxes || !x.text.s))
        s = ts_fail(TS_ERR_NOMEM, "fed: round %d", r);
    uint64_t up = 0, down = 0;
    double weights[MAX_PEERS + 1] = {0}, wsum = 0, t_sent = now_s(), t_agg = 0;
    int k = 0;
    if (s == TS_OK) {
        uint8_t all[MAX_PEERS + 1];
        memset(all, 1, sizeof all);
        memcpy(buf + 20, a->global, (size_t)a->n * 4);
        for (int id = 1; id <= q.mm; id++) {
            peer *p = &a->cl[q.idx[id]];
            weights[id] = total > 0 ? (double)p->samples / total : 0;
            put_f64(buf, weights[id]);
            put_u32(buf + 8, (uint32_t)id);
            put_u32(buf + 12, (uint32_t)q.mm);
            put_u32(buf + 16, (uint32_t)q.t);
            if (ts_fed_send(p->c, TS_FED_MSG_ROUND, (uint64_t)r, buf, rb) != TS_OK) {
                drop(p, ts_last_error());
            } else {
                down += rb;
                fedr_obs_client(a, p->name, 0, rb);
            }
        }
        t_sent = now_s();
        collect(a, &q, r, TS_FED_MSG_MKEYS, sizeof(ts_mask_keys), all, q.u1, take_keys, &x, &up);
        memcpy(buf, q.u1, (size_t)q.mm + 1);
        memcpy(buf + q.mm + 1, x.keys, ((size_t)q.mm + 1) * sizeof *x.keys);
        send_all(a, &q, r, TS_FED_MSG_KEYSET, q.u1, buf, (size_t)(q.mm + 1) * 65, NULL, &x, &down);
        collect(a, &q, r, TS_FED_MSG_SHARES, per, q.u1, q.u2, take_shares, &x, &up);
        send_all(a, &q, r, TS_FED_MSG_BOXES, q.u2, buf, (size_t)q.mm + 1 + per, make_boxes, &x,
                 &down);
        collect(a, &q, r, TS_FED_MSG_MASKED, (uint64_t)a->n * 4, q.u2, q.u3, take_masked, &x, &up);
        for (int id = 1; id <= q.mm; id++)
            if (q.u3[id]) k++, wsum += (double)a->cl[q.idx[id]].samples;
        wsum = total > 0 ? wsum / total : 0; /* exact sums of integers: any id order */
        if (k < a->fp->min_clients)
            s = ts_fail(TS_ERR_IO,
                        "fed: round %d: %d masked updates arrived, fed.min_clients is %d", r, k,
                        a->fp->min_clients);
    }
    if (s == TS_OK) {
        memcpy(buf, q.u2, (size_t)q.mm + 1);
        memcpy(buf + q.mm + 1, q.u3, (size_t)q.mm + 1);
        send_all(a, &q, r, TS_FED_MSG_UNMASK, q.u3, buf, 2 * ((size_t)q.mm + 1), NULL, &x, &down);
        uint8_t answered[MAX_PEERS + 1] = {0};
        collect(a, &q, r, TS_FED_MSG_ANSWERS, (uint64_t)(q.mm + 1) * SHARE_WIRE, q.u3, answered,
                take_answers, &x, &up);
        double ta = now_s();
        int summed = 0;
        s = ts_mask_server_finish(x.sv, q.u2, sum, &summed);
        t_agg = now_s() - ta;
        if (s != TS_OK) ts_error_prefix("fed: round %d", r);
    }
    int dropped = 0;
    for (int id = 1; id <= q.mm; id++) dropped += !a->cl[q.idx[id]].alive;
    if (s == TS_OK)
        s = fedr_agg_finish(a, r, k, dropped, wsum, x.text.s, x.text.len, sum, (size_t)a->n * 4, up,
                            down, t0, t_sent, t_agg, metrics);
    ts_mask_server_free(x.sv);
    free(buf);
    free(sum);
    free(x.keys);
    free(x.boxes);
    free(x.text.s);
    return s;
}

/* ---- client ---- */

ts_status fedr_client_round_mask(const ts_fed_params *fp, ts_fed_conn *c, const ts_fed_msg *m,
                                 const ts_fed_pack *pack, int64_t n, ts_fed_train_fn train,
                                 void *user, float *local, float *delta, uint64_t *u,
                                 double *train_s, double *mask_s, double *up_s) {
    (void)fp;
    uint64_t r = m->round;
    if (m->len != 20 + (uint64_t)n * 4)
        return ts_fail(TS_ERR_FORMAT, "fed: client: a round message of the wrong size");
    double weight = get_f64(m->data);
    int id = (int)get_u32(m->data + 8), mm = (int)get_u32(m->data + 12),
        t = (int)get_u32(m->data + 16);
    const float *global = (const float *)(m->data + 20);
    if (mm < 2 || mm > MAX_PEERS)
        return ts_fail(TS_ERR_FORMAT, "fed: client: a round of %d clients", mm);
    ts_mask_client *mc = NULL;
    ts_status s = ts_mask_client_new(id, mm, t, r, &mc);
    size_t per = (size_t)mm * TS_MASK_BOX;
    uint8_t *boxes = malloc(per);
    uint32_t *y = malloc((size_t)n * 4);
    ts_mask_share sh[MAX_PEERS + 1];
    uint8_t ans[(MAX_PEERS + 1) * SHARE_WIRE];
    if (s == TS_OK && (!boxes || !y))
        s = ts_fail(TS_ERR_NOMEM, "fed: client round %llu", (unsigned long long)r);
    ts_mask_keys mine;
    if (s == TS_OK) {
        ts_mask_client_keys(mc, &mine);
        s = ts_fed_send(c, TS_FED_MSG_MKEYS, r, &mine, sizeof mine);
    }
    ts_fed_msg k = {0};
    if (s == TS_OK) s = expect(c, TS_FED_MSG_KEYSET, r, (uint64_t)(mm + 1) * 65, &k);
    if (s == TS_OK && k.len != (uint64_t)(mm + 1) * 65)
        s = ts_fail(TS_ERR_FORMAT, "fed: client: a key set of the wrong size");
    uint8_t u2[MAX_PEERS + 1] = {0}, u3[MAX_PEERS + 1] = {0};
    if (s == TS_OK) {
        ts_mask_keys *keys = malloc(((size_t)mm + 1) * sizeof *keys);
        if (!keys)
            s = ts_fail(TS_ERR_NOMEM, "fed: client keys");
        else
            memcpy(keys, k.data + mm + 1, ((size_t)mm + 1) * sizeof *keys);
        if (s == TS_OK) s = ts_mask_client_share(mc, keys, k.data, boxes);
        free(keys);
    }
    ts_fed_msg_free(&k);
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_SHARES, r, boxes, per);
    if (s == TS_OK) s = expect(c, TS_FED_MSG_BOXES, r, (uint64_t)mm + 1 + per, &k);
    if (s == TS_OK && k.len != (uint64_t)mm + 1 + per)
        s = ts_fail(TS_ERR_FORMAT, "fed: client: share boxes of the wrong size");
    if (s == TS_OK) memcpy(u2, k.data, (size_t)mm + 1);
    for (int from = 1; s == TS_OK && from <= mm; from++)
        if (u2[from] && from != id)
            s = ts_mask_client_accept(mc, from, k.data + mm + 1 + (size_t)(from - 1) * TS_MASK_BOX);
    ts_fed_msg_free(&k);
    /* local training, then the masked, weighted update */
    double t0 = now_s();
    if (s == TS_OK) s = train(user, (int)r, global, local, n);
    double t1 = now_s();
    *train_s = t1 - t0;
    for (int64_t i = 0; s == TS_OK && i < n; i++) delta[i] = local[i] - global[i];
    int64_t clipped = 0;
    if (s == TS_OK) s = ts_fed_quantize(pack, delta, n, weight, u, &clipped);
    if (s == TS_OK && clipped)
        ts_logf(TS_LOG_WARN,
                "fed: round %llu: %lld update values beyond ±fed.clip = %g were clipped",
                (unsigned long long)r, (long long)clipped, pack->clip);
    for (int64_t i = 0; s == TS_OK && i < n; i++) y[i] = (uint32_t)u[i];
    if (s == TS_OK) s = ts_mask_client_mask(mc, u2, y, n, y);
    *mask_s = now_s() - t1;
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_MASKED, r, y, (uint64_t)n * 4);
    *up_s = now_s() - t1 - *mask_s;
    if (s == TS_OK) s = expect(c, TS_FED_MSG_UNMASK, r, 2 * ((uint64_t)mm + 1), &k);
    if (s == TS_OK && k.len != 2 * ((uint64_t)mm + 1))
        s = ts_fail(TS_ERR_FORMAT, "fed: client: an unmask request of the wrong size");
    if (s == TS_OK) {
        /* the aggregator's U2 must be the one this client masked with */
        if (memcmp(k.data, u2, (size_t)mm + 1) != 0)
            s = ts_fail(TS_ERR_FORMAT,
                        "fed: client: the unmask request names other clients than the round did");
        else
            memcpy(u3, k.data + mm + 1, (size_t)mm + 1);
    }
    ts_fed_msg_free(&k);
    if (s == TS_OK) s = ts_mask_client_unmask(mc, u2, u3, sh);
    for (int v = 0; s == TS_OK && v <= mm; v++) share_put(ans + (size_t)v * SHARE_WIRE, &sh[v]);
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_ANSWERS, r, ans, (size_t)(mm + 1) * SHARE_WIRE);
    ts_mask_client_free(mc);
    free(boxes);
    free(y);
    return s;
}
