/* roles_internal.h — what roles.c (the Paillier rounds) and roles_mask.c
 * (the masking rounds) share: the aggregator's state and small helpers.
 * Internal to src/fed. */
#ifndef TS_FED_ROLES_INTERNAL_H
#define TS_FED_ROLES_INTERNAL_H

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "fed/keysig.h"
#include "fed/obs.h"
#include "fed/roles.h"
#include "fed/update.h"
#include "fed/wire.h"

#define MAX_PEERS 256
/* The most bytes of the aggregator's error a DONE message carries. */
#define FEDR_DONE_MAX 600

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void put_f64(uint8_t *p, double v) {
    memcpy(p, &v, 8);
}
static inline double get_f64(const uint8_t *p) {
    double v;
    memcpy(&v, p, 8);
    return v;
}

/* Receives the next frame and checks its type and round. */
static inline ts_status expect(ts_fed_conn *c, uint32_t type, uint64_t round, uint64_t max_len,
                               ts_fed_msg *m) {
    ts_status s = ts_fed_recv(c, max_len, m);
    if (s != TS_OK) return s;
    if (m->round != round) {
        s = ts_fail(TS_ERR_FORMAT,
                    "fed: %s sent a message of round %llu during round %llu (replayed or stale)",
                    ts_fed_peer(c), (unsigned long long)m->round, (unsigned long long)round);
    } else if (m->type != type) {
        s = ts_fail(TS_ERR_FORMAT, "fed: %s sent a message of type %u, expected %u", ts_fed_peer(c),
                    m->type, type);
    }
    if (s != TS_OK) ts_fed_msg_free(m);
    return s;
}

static inline void sha256_hex(const void *data, size_t n, char hex[65]) {
    unsigned char h[32];
    unsigned int k = 0;
    EVP_Digest(data, n, h, &k, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

typedef struct peer {
    ts_fed_conn *c; /* NULL once dropped */
    char name[256]; /* its certificate's CN */
    uint64_t samples;
    int alive, has_key;
} peer;

typedef struct agg {
    const ts_fed_params *fp;
    ts_fed_conn *kh;
    peer cl[MAX_PEERS];
    int n_cl;
    ts_paillier_pub *pk;
    char *pub_text;
    uint64_t pub_len;
    ts_fed_pack pack;
    float *global;
    int64_t n;
} agg;

/* Bytes to and from a client, for the role's Prometheus metrics. */
static inline void fedr_obs_client(agg *a, const char *name, uint64_t up, uint64_t down) {
    ts_fed_obs_bytes(a->fp->obs, name, up, down);
}

static inline void drop(peer *p, const char *why) {
    ts_logf(TS_LOG_WARN, "fed: dropping client %s: %s", p->name, why);
    p->alive = 0;
    ts_fed_close(p->c);
    p->c = NULL;
}

/* Sends round r's message to a client; one that cannot take it is dropped
 * (counted in *dropped), the bytes sent are added to *down. */
static inline void send_round(agg *a, peer *p, int r, const uint8_t *msg, size_t bytes,
                              int *dropped, uint64_t *down) {
    if (ts_fed_send(p->c, TS_FED_MSG_ROUND, (uint64_t)r, msg, bytes) != TS_OK) {
        drop(p, ts_last_error());
        (*dropped)++;
    } else {
        *down += bytes;
        fedr_obs_client(a, p->name, 0, bytes);
    }
}

/* Takes a client's round-r update of exactly `bytes` bytes into *m: 1, or
 * 0 with the client dropped (counted in *dropped) and nothing to free. */
static inline int recv_update(peer *p, int r, size_t bytes, ts_fed_msg *m, int *dropped) {
    if (expect(p->c, TS_FED_MSG_UPDATE, (uint64_t)r, bytes, m) != TS_OK) {
        drop(p, ts_last_error());
        (*dropped)++;
        return 0;
    }
    if (m->len != bytes) {
        ts_fed_msg_free(m);
        drop(p, "an update of the wrong size");
        (*dropped)++;
        return 0;
    }
    return 1;
}

/* The audit text of a round: "name bytes sha256" of each accepted update,
 * joined by ';' (what fedr_agg_finish sends the key holder for its log). */
typedef struct fedr_text {
    char *s;
    size_t len, cap;
} fedr_text;

/* Room for n clients' entries: 1, or 0 when out of memory. */
static inline int fedr_text_init(fedr_text *t, int n) {
    t->cap = (size_t)n * 400 + 1;
    t->len = 0;
    t->s = calloc(t->cap, 1);
    return t->s != NULL;
}

static inline void fedr_text_add(fedr_text *t, const char *name, const ts_fed_msg *m) {
    char hex[65];
    sha256_hex(m->data, m->len, hex);
    t->len += (size_t)snprintf(t->s + t->len, t->cap - t->len, "%s%s %llu %s", t->len ? ";" : "",
                               name, (unsigned long long)m->len, hex);
}

/* Sends round r's ROUND message (the client's FedAvg weight, then the global
 * model) to every alive client; weights[i] gets client i's weight, *total
 * the samples of them all. Clients that cannot take it are dropped. */
ts_status fedr_send_rounds(agg *a, int r, double *weights, double *total, int *dropped,
                           uint64_t *down);

/* Records an accepted update of client p: its audit entry, the bytes
 * received (*up and the metrics) and its samples (*wsum). */
static inline void fedr_accept(agg *a, const peer *p, const ts_fed_msg *m, fedr_text *t,
                               uint64_t *up, double *wsum) {
    fedr_text_add(t, p->name, m);
    *up += m->len;
    fedr_obs_client(a, p->name, m->len, 0);
    *wsum += (double)p->samples; /* integers: exact in any order */
}

/* TS_OK when k updates make a round (fed.min_clients), else the error. */
static inline ts_status fedr_quorum(const agg *a, int r, int k, int dropped) {
    if (k >= a->fp->min_clients) return TS_OK;
    return ts_fail(TS_ERR_IO,
                   "fed: round %d: %d updates arrived (%d clients dropped), fed.min_clients is %d",
                   r, k, dropped, a->fp->min_clients);
}

/* Sends the round's aggregate (body: ciphertexts or masked sums) with its
 * participants to the key holder, takes the new global model back and
 * writes the round's metrics line; frees nothing of the caller's. */
ts_status fedr_agg_finish(agg *a, int r, int k, int dropped, double wsum, const char *text,
                          size_t text_len, const void *body, size_t body_len, uint64_t up,
                          uint64_t down, double t0, double t_sent, double t_agg, FILE *metrics);
/* The fixed point of masking (sums must fit uint32 lanes), or an error
 * naming the keys to lower (roles.c). */
/* What a DONE from the aggregator means to `role` (client, key holder) that
 * took part in `last` of `rounds` rounds: an error naming the aggregator's
 * message when it carries one or when rounds are missing, else TS_OK. */
ts_status fedr_done_status(const ts_fed_msg *m, const char *role, uint64_t last, int rounds);
ts_status fedr_mask_pack(const ts_fed_params *fp, ts_fed_pack *pack);
/* Paillier: the SETUP message (roles_keyholder.c): the clients admitted,
 * the packing's headroom, in [1, fed.max_clients]; `role` names the
 * receiver in errors, and a DONE instead (admission failed) is the
 * aggregator's error. */
ts_status fedr_recv_setup(const ts_fed_params *fp, ts_fed_conn *c, const char *role, int *headroom);
/* One aggregator round with fed.secure: none (roles_plain.c). */
ts_status fedr_agg_round_plain(agg *a, int r, FILE *metrics);
/* One client round with fed.secure: none: m is the ROUND message;
 * *train_s gets the local training's seconds, *up_s the sending of the update's. */
ts_status fedr_client_round_plain(ts_fed_conn *c, const ts_fed_msg *m, int64_t n,
                                  ts_fed_train_fn train, void *user, float *local, float *delta,
                                  double *train_s, double *up_s);
/* One aggregator round in masking mode (roles_mask.c). */
ts_status fedr_agg_round_mask(agg *a, int r, FILE *metrics);
/* One client round in masking mode: m is the ROUND message; *train_s,
 * *mask_s and *up_s get the seconds of the local training, the masking and
 * the sending of the masked update. */
ts_status fedr_client_round_mask(const ts_fed_params *fp, ts_fed_conn *c, const ts_fed_msg *m,
                                 const ts_fed_pack *pack, int64_t n, ts_fed_train_fn train,
                                 void *user, float *local, float *delta, uint64_t *u,
                                 double *train_s, double *mask_s, double *up_s);

#endif
